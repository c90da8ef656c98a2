"""drivers.toml: the schema, and the problems it reports with the file named."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging.format import PackageError
from cloudshell_mutex.packaging.manifest import load_manifest, parse_manifest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
[[driver]]
name = "{name}"
source = "drivers/{folder}"
version = "1.0.0"
python_version = "3"
main_class = "driver.D"
models = ["{model}"]
requirements = ["cloudshell-mutex=={{project_version}}"]
"""


def driver(name: str = "Mutex Service Driver", folder: str = "m", model: str = protocol.SERVICE_MODEL) -> str:
    return DRIVER.format(name=name, folder=folder, model=model)


def test_the_repository_manifest_loads() -> None:
    """Until the Mutex Service driver lands ([4/8]) it declares none; after, each driver serves a model."""
    for spec in load_manifest(ROOT / "drivers.toml").drivers:
        assert spec.models


def test_a_driver_entry(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "2.3.4"\n')
    manifest = parse_manifest(driver(), tmp_path)
    (spec,) = manifest.drivers
    assert spec.name == "Mutex Service Driver"
    assert spec.source == tmp_path / "drivers" / "m"
    assert (spec.version, spec.python_version, spec.main_class) == ("1.0.0", "3", "driver.D")
    assert spec.models == (protocol.SERVICE_MODEL,)
    assert spec.requirements == ("cloudshell-mutex==2.3.4",)
    assert spec.main_module_file == "driver.py"
    assert manifest.drivers_for(protocol.SERVICE_MODEL) == ("Mutex Service Driver",)
    assert manifest.drivers_for("Other") == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[driver]\nname = 1", "drivers.toml: invalid TOML"),
        (driver() + driver(model="Other"), "drivers.toml: duplicate driver name 'Mutex Service Driver'"),
        (
            driver() + driver(name="MUTEX service driver", model="Other"),
            "drivers.toml: duplicate driver name 'MUTEX service driver' (also 'Mutex Service Driver'",
        ),
        (driver() + driver(name="Second"), "drivers.toml: model 'Mutex Service' is served by both"),
        (driver().replace('python_version = "3"', 'python_version = "2"'), "python_version '2'"),
        (driver(name="a/b"), "drivers.toml: driver 'a/b': the name must be a valid Windows file name"),
        (driver() + "colour = 1\n", "drivers.toml: driver 'Mutex Service Driver': unknown key(s) colour"),
        (driver().replace('version = "1.0.0"\n', ""), "missing key(s) version"),
        (driver().replace('version = "1.0.0"', 'version = "v1"'), "version 'v1' is not like 1.0.0"),
        (driver().replace('models = ["Mutex Service"]', "models = []"), "models must name at least one"),
        (driver().replace('"driver.D"', '"D"'), "main_class 'D' is not like driver.ClassName"),
        ('[driver]\nname = "x"\n', "driver must be an array of tables"),
        ("[package]\n", "unknown top-level key(s) package"),
        (
            driver(folder="../../elsewhere"),
            "source 'drivers/../../elsewhere' must be a subfolder of the folder",
        ),
        (driver().replace('"drivers/m"', '"/opt/driver"'), "source '/opt/driver' must be a subfolder"),
        (driver().replace('"drivers/m"', '"C:/driver"'), "source 'C:/driver' must be a subfolder"),
        (driver().replace('"drivers/m"', '"drivers\\\\m"'), "must be a subfolder"),
        (driver().replace('"drivers/m"', '"."'), "source '.' must be a subfolder"),
    ],
)
def test_manifest_problems(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    with pytest.raises(PackageError) as caught:
        parse_manifest(text, tmp_path)
    assert problem in str(caught.value)
    assert str(caught.value).startswith("drivers.toml: ")


def test_project_version_needs_a_pyproject(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=r"requirements use \{project_version\} but there is no pyproject"):
        parse_manifest(driver(), tmp_path)


def test_a_declared_driver_folder_must_exist(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    (tmp_path / "drivers.toml").write_text(driver(folder="missing"))
    with pytest.raises(PackageError) as caught:
        load_manifest(tmp_path / "drivers.toml", "drivers.toml")
    assert str(caught.value) == (
        "drivers.toml: driver 'Mutex Service Driver': source folder drivers/missing does not exist"
    )


def test_the_main_class_module_must_exist(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    (tmp_path / "drivers" / "m").mkdir(parents=True)
    (tmp_path / "drivers.toml").write_text(driver())
    with pytest.raises(
        PackageError, match=r"drivers/m/driver\.py \(the module of driver\.D\) does not exist"
    ):
        load_manifest(tmp_path / "drivers.toml", "drivers.toml")
