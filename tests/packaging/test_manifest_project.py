"""drivers.toml reads the project's version and dependencies from pyproject.toml at build time, so the
Mutex Service driver changes version with the library and installs what the library declares."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import pytest

from cloudshell_mutex import __version__, protocol
from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes
from cloudshell_mutex.packaging.format import PackageError, read_package
from cloudshell_mutex.packaging.manifest import load_project, parse_manifest, project_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

DYNAMIC = """
[project]
name = "lib"
dynamic = ["version"]
dependencies = ["api>1,<2", "filelock>=3"]

[project.optional-dependencies]
driver = ["core>=6,<7", "logging~=2.0"]
cli = ["yaml"]
itself = ["lib[cli]"]

[tool.hatch.version]
path = "src/lib/__init__.py"
"""

DRIVER = """
[[driver]]
name = "D"
source = "drivers/m"
version = "VERSION"
python_version = "3"
main_class = "driver.D"
models = ["{model}"]
requirements = REQUIREMENTS
""".replace("{model}", protocol.SERVICE_MODEL)


def project(tmp_path: Path, version_line: str = '__version__ = "2.5.1"\n') -> Path:
    (tmp_path / "pyproject.toml").write_text(DYNAMIC)
    (tmp_path / "src" / "lib").mkdir(parents=True)
    (tmp_path / "src" / "lib" / "__init__.py").write_text(f'"""Lib."""\n\n{version_line}')
    return tmp_path


def driver(
    version: str = "{project_version}", requirements: str = '["{project_dependencies[driver]}"]'
) -> str:
    return DRIVER.replace("VERSION", version).replace("REQUIREMENTS", requirements)


def test_the_version_comes_from_the_file_hatch_reads(tmp_path: Path) -> None:
    assert project_version(project(tmp_path)) == "2.5.1"
    (spec,) = parse_manifest(driver(), tmp_path).drivers
    assert spec.version == "2.5.1"


def test_a_static_version_still_works(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "3.0.0"\n')
    assert parse_manifest(driver(requirements='["x~={project_version}"]'), tmp_path).drivers[
        0
    ].requirements == ("x~=3.0.0",)


def test_the_dependencies_placeholder_expands_to_the_declared_ranges(tmp_path: Path) -> None:
    project(tmp_path)
    (plain,) = parse_manifest(driver(requirements='["{project_dependencies}", "extra>1"]'), tmp_path).drivers
    assert plain.requirements == ("api>1,<2", "filelock>=3", "extra>1")
    (spec,) = parse_manifest(driver(requirements='["{project_dependencies[driver,cli]}"]'), tmp_path).drivers
    assert spec.requirements == ("api>1,<2", "filelock>=3", "core>=6,<7", "logging~=2.0", "yaml")


@pytest.mark.parametrize(
    ("requirements", "problem"),
    [
        (
            '["{project_dependencies[gui]}"]',
            "pyproject.toml has no extra 'gui' (its extras: cli, driver, itself)",
        ),
        ('["{project_dependencies[itself]}"]', "the extra 'itself' names the project itself ('lib[cli]')"),
        ('["{project_dependencies}", "Filelock<4"]', "requirements name filelock more than once"),
    ],
)
def test_expansion_problems_stop_the_build(tmp_path: Path, requirements: str, problem: str) -> None:
    project(tmp_path)
    with pytest.raises(PackageError) as caught:
        parse_manifest(driver(requirements=requirements), tmp_path)
    assert problem in str(caught.value)
    assert str(caught.value).startswith("drivers.toml: driver 'D': ")


def test_placeholders_need_a_pyproject(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=r"version uses \{project_version\} but there is no pyproject"):
        parse_manifest(driver(requirements="[]"), tmp_path)
    with pytest.raises(
        PackageError, match=r"requirements use \{project_dependencies\} but there is no pyproject"
    ):
        parse_manifest(driver(version="1.0.0", requirements='["{project_dependencies}"]'), tmp_path)


def test_a_version_file_without_the_line_is_an_error(tmp_path: Path) -> None:
    project(tmp_path, version_line="VERSION_INFO = (1, 0)\n")
    with pytest.raises(PackageError, match=r'src/lib/__init__.py: no __version__ = "..." line'):
        parse_manifest(driver(), tmp_path)


def test_this_trees_mutex_service_driver_follows_the_library() -> None:
    """The built zip's driver has the library's version and exactly its runtime and driver requirements."""
    package = read_package(build_package_bytes(PackageSources.in_tree(ROOT))[0])
    data = package.drivers["Mutex Service Driver"]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        metadata = archive.read("drivermetadata.xml").decode()
        requirements = archive.read("requirements.txt").decode().splitlines()
        bundled = archive.read("cloudshell_mutex/__init__.py").decode()
    assert f'Version="{__version__}"' in metadata
    assert f'__version__ = "{__version__}"' in bundled
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert requirements == [*declared["dependencies"], *declared["optional-dependencies"]["driver"]]
    assert load_project(ROOT).version == __version__


def test_the_changelog_has_a_section_for_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## [{__version__}]" in changelog
    assert "\n## [Unreleased]" in changelog  # Keep a Changelog: what is not released yet goes here
