"""The offline bundle (``dist/offline_requirements``): a clean Python 3.9 virtualenv installs from it with no
index, for a driver as for the Mutex Service driver, and it is complete for Windows x64 too.

The Windows half cannot be installed here; pip resolves it from the bundle alone (``--platform win_amd64
--no-index``), and the bundle builder's own walk of every wheel's requirements, with Windows' markers, finds
nothing missing. The walk is checked on small wheels made here, where it must find what is missing.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Sequence

import pytest
from release_support import ROOT, dist_tool, offline_venv, run, venv_python

from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes
from cloudshell_mutex.packaging.format import DRIVERS_FOLDER
from python39 import python39

TOOL = dist_tool()


def mutex_service_requirements() -> bytes:
    """The requirements.txt of the Mutex Service driver zip in the package built from this tree."""
    package, _ = build_package_bytes(PackageSources.in_tree(ROOT))
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        driver = archive.read(f"{DRIVERS_FOLDER}/Mutex Service Driver.zip")
    with zipfile.ZipFile(io.BytesIO(driver)) as archive:
        return archive.read("requirements.txt")


@pytest.mark.dist
def test_a_driver_virtualenv_installs_from_the_bundle_alone(tmp_path: Path, bundle: Path) -> None:
    """What a driver's requirements.txt and the Mutex Service driver's ask for, with no index."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_bytes(mutex_service_requirements())
    venv = offline_venv(tmp_path / "venv", bundle, "cloudshell-mutex[driver]", "-r", str(requirements))
    imports = (
        "from cloudshell.shell.core.resource_driver_interface import ResourceDriverInterface; "
        "from cloudshell.shell.core.session.logging_session import LoggingSessionContext; "
        "from cloudshell_mutex.driver import ReservationMutexMixin; import cloudshell_mutex; "
        "print(cloudshell_mutex.__file__)"
    )
    result = run([str(venv_python(venv)), "-c", imports], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(venv) in result.stdout  # the bundle's wheel, not this tree
    checked = run([str(venv_python(venv)), "-m", "pip", "check"])
    assert checked.returncode == 0, checked.stdout


@pytest.mark.dist
def test_a_bundle_missing_a_wheel_does_not_install(tmp_path: Path, bundle: Path) -> None:
    """The control: the install above has no other source to fall back on (no index, no pip settings, a
    refusing proxy), so one wheel taken out of the bundle fails it."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for path in bundle.glob("*.whl"):
        if not path.name.startswith("urllib3-"):
            (partial / path.name).write_bytes(path.read_bytes())
    with pytest.raises(AssertionError, match="urllib3"):
        offline_venv(tmp_path / "venv", partial, "cloudshell-mutex")


@pytest.mark.dist
@pytest.mark.parametrize("platform", TOOL.PLATFORMS, ids=lambda platform: platform.name)
def test_the_bundle_alone_serves_each_execution_server_platform(bundle: Path, wheel: Path, platform) -> None:
    requirements = [f"{bundle / wheel.name}[driver]", *TOOL.driver_requirements(ROOT / "drivers.toml")]
    TOOL.offline_resolves(python39(), platform, requirements, bundle)  # pip, --no-index
    wheels = [TOOL.Wheel.read(path) for path in sorted(bundle.glob("*.whl"))]
    assert TOOL.missing_requirements(wheels, platform, requirements) == []
    # Nothing for other platforms: each wheel is pure, or compiled for one of the execution servers'.
    assert all(w.pure or any(p.supported() & w.tags for p in TOOL.PLATFORMS) for w in wheels)


@pytest.mark.dist
def test_the_bundle_lists_its_wheels_with_their_sha256(bundle: Path) -> None:
    import hashlib

    lines = (bundle / "SHA256SUMS").read_text().splitlines()
    assert sorted(line.split("  ")[1] for line in lines) == sorted(p.name for p in bundle.glob("*.whl"))
    for line in lines:
        digest, name = line.split("  ")
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest


def make_wheel(
    folder: Path, name: str, version: str, requires: Sequence[str] = (), tag: str = "py3-none-any"
):
    """A minimal wheel: a file name with tags and a METADATA with Requires-Dist lines."""
    path = folder / f"{name}-{version}-{tag}.whl"
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"] + [
        f"Requires-Dist: {r}\n" for r in requires
    ]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "".join(lines))
    return TOOL.Wheel.read(path)


def by_name(name: str):
    return next(p for p in TOOL.PLATFORMS if p.name == name)


def test_the_walk_finds_a_dependency_that_only_windows_needs(tmp_path: Path) -> None:
    wheels = [
        make_wheel(
            tmp_path, "app", "1.0", ["base>=1", 'winonly; sys_platform == "win32"', "opt; extra == 'x'"]
        ),
        make_wheel(tmp_path, "base", "1.2"),
    ]
    assert TOOL.missing_requirements(wheels, by_name("manylinux2014_x86_64"), ["app"]) == []
    assert TOOL.missing_requirements(wheels, by_name("win_amd64"), ["app"]) == [
        'winonly; sys_platform == "win32"'
    ]
    # An extra asked for pulls its requirements in.
    assert TOOL.missing_requirements(wheels, by_name("win_amd64"), ["app[x]"]) == [
        "opt; extra == \"x\"", 'winonly; sys_platform == "win32"',
    ]  # fmt: skip


def test_the_walk_needs_a_wheel_of_the_right_platform_and_version(tmp_path: Path) -> None:
    wheels = [
        make_wheel(tmp_path, "app", "1.0", ["native>=2"]),
        make_wheel(tmp_path, "native", "2.0", tag="cp39-cp39-win_amd64"),
        make_wheel(tmp_path, "old", "1.0"),
    ]
    assert TOOL.missing_requirements(wheels, by_name("win_amd64"), ["app"]) == []
    assert TOOL.missing_requirements(wheels, by_name("manylinux2014_x86_64"), ["app"]) == ["native>=2"]
    assert TOOL.missing_requirements(wheels, by_name("win_amd64"), ["old>=2"]) == ["old>=2"]
    # A local wheel path stands for its project at that version.
    assert (
        TOOL.missing_requirements(wheels, by_name("win_amd64"), [str(tmp_path / "app-1.0-py3-none-any.whl")])
        == []
    )
