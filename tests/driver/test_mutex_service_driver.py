"""The Mutex Service driver run the way CloudShell runs it: from its zip, on Python 3.9, with only its
requirements installed.

The package is built from this tree, the driver zip is extracted into a temporary folder, and a small harness
runs in a Python 3.9 virtualenv that has only the zip's ``requirements.txt`` installed (cached under
``.venv-driver39/<hash of the requirements>``). It receives a real shell-core ``ResourceCommandContext`` for
the service (pickled, as CloudShell hands the driver a deserialised one), pointing at an emulator started
here, and calls ``LockStatus`` and ``ForceRelease``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

from cloudshell_mutex import MutexError, ReservationMutex
from cloudshell_mutex.demo.contexts import resource_command_context
from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes
from cloudshell_mutex.packaging.format import DRIVERS_FOLDER
from python39 import python39

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DRIVER_NAME = "Mutex Service Driver"
VENV_CACHE = ROOT / ".venv-driver39"

#: Runs in the driver's venv with the driver folder first on sys.path, as CloudShell runs a driver.
HARNESS = """
import importlib.util, json, pickle, sys, traceback

driver_dir, context_file, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, driver_dir)
import driver  # the zip's driver.py
import cloudshell_mutex

with open(context_file, "rb") as handle:
    context = pickle.load(handle)
instance = driver.MutexServiceDriver()
instance.initialize(context)
results = []
for name, args in calls:
    try:
        results.append({"ok": True, "text": getattr(instance, name)(context, *args)})
    except Exception as error:
        results.append({"ok": False, "error": type(error).__name__, "text": str(error)})
instance.cleanup()
print(json.dumps({
    "python": list(sys.version_info[:2]),
    "library": cloudshell_mutex.__file__,
    "emulator_shipped": importlib.util.find_spec("cloudshell_mutex.emulator") is not None,
    "packaging_shipped": importlib.util.find_spec("cloudshell_mutex.packaging") is not None,
    "results": results,
}))
"""


def driver_venv(requirements: bytes) -> Path:
    """A Python 3.9 virtualenv with only ``requirements`` installed, cached by their hash."""
    key = hashlib.sha256(requirements).hexdigest()[:16]
    venv = VENV_CACHE / key
    if (venv / ".installed").is_file():
        return venv
    building = VENV_CACHE / f"{key}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([python39(), "-m", "venv", str(building)], check=True)
    (building / "requirements.txt").write_bytes(requirements)
    pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "-r", str(building / "requirements.txt")], check=True, timeout=600)
    (building / ".installed").write_text("")
    with contextlib.suppress(OSError):  # another run finished first: use the one in place
        os.replace(building, venv)
    shutil.rmtree(building, ignore_errors=True)
    return venv


@pytest.fixture(scope="module")
def driver_zip() -> Dict[str, bytes]:
    """The driver zip's entries, from a package built from this tree."""
    package, _ = build_package_bytes(PackageSources.in_tree(ROOT))
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        data = archive.read(f"{DRIVERS_FOLDER}/{DRIVER_NAME}.zip")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.fixture(scope="module")
def venv(driver_zip) -> Path:
    return driver_venv(driver_zip["requirements.txt"])


@pytest.fixture
def sandbox(cloudshell_emulator_factory, tmp_path):
    """An emulator with this tree's package imported, and a reservation."""
    emu = cloudshell_emulator_factory(packages=[build_package_bytes(PackageSources.in_tree(ROOT))[0]])
    emu.add_user("ops-alice", "alice-password", domain="Global", role="DomainAdmin")  # who runs the commands
    return emu, emu.create_reservation("admin")


def run_driver(venv: Path, driver_zip, tmp_path: Path, emu, reservation_id: str, calls: List[Any]) -> Dict:
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    for name, data in driver_zip.items():
        (driver_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (driver_dir / name).write_bytes(data)
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), reservation_id, "MUTEX")
    # The service's own context: its alias is the resource name.
    context.resource.model, context.resource.family, context.resource.type = (
        "Mutex Service", "Mutex Service Family", "Service",
    )  # fmt: skip
    context.reservation.running_user = "ops-alice"
    (tmp_path / "context.pickle").write_bytes(pickle.dumps(context, protocol=4))
    (tmp_path / "harness.py").write_text(HARNESS)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    environment["LOG_PATH"] = str(tmp_path / "logs")
    result = subprocess.run(
        [str(venv / "bin" / "python"), str(tmp_path / "harness.py"), str(driver_dir),
         str(tmp_path / "context.pickle"), json.dumps(calls)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["python"] == [3, 9]
    assert report["library"].startswith(str(driver_dir))  # the bundled copy, not an installed one
    assert not report["emulator_shipped"] and not report["packaging_shipped"]
    return report


def test_lock_status_then_force_release_from_the_zip_on_python39(venv, driver_zip, sandbox, tmp_path):
    emu, reservation_id = sandbox
    lock = ReservationMutex(emu.session(), reservation_id, owner="Router A driver")
    assert lock.acquire(timeout=10)
    calls = [
        ["LockStatus", []],
        ["ForceRelease", [""]],  # refused: no reason
        ["ForceRelease", ["driver crashed on exec-02"]],
        ["LockStatus", []],
        ["ForceRelease", ["again"]],
    ]
    status, refused, released, after, again = run_driver(
        venv, driver_zip, tmp_path, emu, reservation_id, calls
    )["results"]
    assert status["ok"] and "held by Router A driver" in status["text"] and lock.token in status["text"]
    assert f"Mutex Owner: {lock.token}" in status["text"]
    assert "held now" in status["text"] and "--watch" not in status["text"]  # a flag the portal has not
    # Every lock service in the sandbox follows (list_locks): here the one lock, exclusive.
    assert "1 lock service(s) in reservation" in status["text"]
    assert "MUTEX: exclusive, held by Router A driver" in status["text"]
    assert not refused["ok"] and "needs a reason" in refused["text"]
    assert released["ok"]
    record = "ops-alice (Mutex Service command Force Release) force-released 'MUTEX'"
    assert record in released["text"] and lock.token in released["text"]
    assert "Reason: driver crashed on exec-02" in released["text"]
    assert emu.control.reservation(reservation_id)["services"] == []
    output = emu.control.output(reservation_id)
    assert any(record in line and "Reason: driver crashed on exec-02" in line for line in output)
    assert after["ok"] and "is free" in after["text"] and "no lock services in reservation" in after["text"]
    assert again["ok"] and "nobody held it" in again["text"]
    assert any("nobody held it" in line for line in emu.control.output(reservation_id))


def test_an_ended_reservation_fails_the_command_clearly(venv, driver_zip, sandbox, tmp_path):
    emu, reservation_id = sandbox
    emu.session().EndReservation(reservation_id)
    (status, release) = run_driver(
        venv, driver_zip, tmp_path, emu, reservation_id, [["LockStatus", []], ["ForceRelease", ["x"]]]
    )["results"]
    for result in (status, release):
        assert not result["ok"] and result["error"] == "MutexError" and "has ended" in result["text"]


def test_the_driver_zip_holds_what_cloudshell_needs(driver_zip):
    assert {"driver.py", "drivermetadata.xml", "requirements.txt"} <= set(driver_zip)
    metadata = driver_zip["drivermetadata.xml"].decode()
    assert 'MainClass="driver.MutexServiceDriver"' in metadata and 'PythonVersion="3"' in metadata
    assert 'DisplayName="Lock Status"' in metadata and 'DisplayName="Force Release"' in metadata
    assert not any(name.startswith(("cloudshell/", "cloudshell_mutex/emulator/")) for name in driver_zip)
    assert sys.version_info >= (3, 9)


def load_driver_module():
    """drivers/mutex_service/driver.py, imported in this process (the zip's copy runs on Python 3.9 above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mutex_service_driver", ROOT / "drivers/mutex_service/driver.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "running_user, allowed",
    [
        ("admin", True),  # a system administrator
        ("dana", True),  # a domain administrator of the sandbox's domain
        ("rob", False),  # a regular user of that domain
        ("sam", False),  # a domain administrator of another domain
        ("ghost", False),  # a user the server does not know
        ("", False),  # CloudShell named nobody
    ],
)
def test_force_release_is_for_system_admins_and_domain_admins_of_the_sandboxs_domain(
    cloudshell_emulator_factory, tmp_path, monkeypatch, running_user, allowed
):
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    emu = cloudshell_emulator_factory(packages=[build_package_bytes(PackageSources.in_tree(ROOT))[0]])
    emu.add_user("dana", "pw", domain="Sales", role="DomainAdmin")
    emu.add_user("rob", "pw", domain="Sales")
    emu.add_user("sam", "pw", domain="Global", role="DomainAdmin")
    reservation_id = emu.create_reservation("rule", domain="Sales")
    holder = ReservationMutex(emu.session(domain="Sales"), reservation_id, owner="Router A driver")
    assert holder.acquire(timeout=10)
    context = resource_command_context(emu.host, emu.port, emu.issue_token(), reservation_id, "MUTEX")
    context.reservation.domain = "Sales"
    context.reservation.running_user = running_user
    driver = load_driver_module().MutexServiceDriver()
    if allowed:
        assert "force-released 'MUTEX'" in driver.ForceRelease(context, "stuck <b>since</b> noon")
        assert emu.control.reservation(reservation_id)["services"] == []
        return
    with pytest.raises(MutexError) as refused:
        driver.ForceRelease(context, "stuck")
    text = str(refused.value)
    assert text.startswith(
        "refused: Force Release is for system administrators, and domain administrators of"
    )
    assert "('Sales')" in text and "may still be using" in text
    why = {
        "rob": "rob is neither a system administrator nor a domain administrator of 'Sales'",
        "sam": "sam is neither a system administrator nor a domain administrator of 'Sales'",
        "ghost": "ghost's role could not be checked (GetUserDetails: User 'ghost' was not found)",
        "": "CloudShell did not say which user runs this command",
    }[running_user]
    assert why in text
    assert [s["alias"] for s in emu.control.reservation(reservation_id)["services"]] == ["MUTEX"]  # untouched
    assert emu.control.output(reservation_id) == []
