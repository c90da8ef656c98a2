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


@pytest.mark.parametrize(
    "name",
    [
        "CON",
        "con",
        "Prn",
        "AUX",
        "NUL",
        "nul.txt",
        "CON .tar",
        "COM1",
        "com9.driver",
        "LPT1",
        "lpt9",
        "COM0",
        "LPT\u00b9",
        "CONIN$",
    ],
)
def test_windows_device_names_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    with pytest.raises(PackageError) as caught:
        parse_manifest(driver(name=name), tmp_path)
    assert str(caught.value).startswith(
        f"drivers.toml: driver {name!r}: the name must be a valid Windows file"
    )
    assert "is a device name that Windows reserves" in str(caught.value)


@pytest.mark.parametrize("name", ["CONSOLE", "COM10", "LPT", "Null Driver", "AUXILIARY.x", "My CON Driver"])
def test_names_that_only_look_like_devices_are_fine(tmp_path: Path, name: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    assert parse_manifest(driver(name=name), tmp_path).drivers[0].name == name


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("a<b", "'<'"),
        ("a>b", "'>'"),
        ("a:b", "':'"),
        ('a\\"b', "'\"'"),
        ("a\\\\b", "'\\\\'"),  # TOML "a\\b" is a\b
        ("a|b", "'|'"),
        ("a?b", "'?'"),
        ("a*b", "'*'"),
        ("a\\tb", "'\\t'"),  # TOML "a\tb" holds a tab
        (" lead", "start or end with a space"),
        ("trail.", "end with a dot"),
    ],
)
def test_characters_windows_forbids_are_refused(tmp_path: Path, name: str, shown: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    with pytest.raises(PackageError, match="the name must be a valid Windows file name") as caught:
        parse_manifest(driver(name=name), tmp_path)
    assert shown in str(caught.value)


@pytest.mark.parametrize(
    ("requirement", "problem"),
    [
        ("x\\n--index-url https://evil.example/simple", "U+000A"),
        ("x\\r\\n-r other.txt", "U+000A, U+000D"),
        ("cloudshell-automation-api\\u2028--extra-index-url https://e.example", "U+2028"),
        ("x\\u0085y", "U+0085"),
        ("x\\u0000", "U+0000"),
        ("x\\ty", "U+0009"),
        ("--index-url https://evil.example/simple", "is a pip option, not a requirement"),
        ("-r other.txt", "is a pip option, not a requirement"),
        (" -e git+https://e.example/x.git", "is a pip option, not a requirement"),
    ],
)
def test_a_requirement_is_one_line_and_not_an_option(tmp_path: Path, requirement: str, problem: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    text = driver().replace('"cloudshell-mutex=={project_version}"', f'"{requirement}"')
    with pytest.raises(PackageError) as caught:
        parse_manifest(text, tmp_path)
    message = str(caught.value)
    assert message.startswith("drivers.toml: driver 'Mutex Service Driver': requirement ")
    assert problem in message
    assert "\n" not in message and "\r" not in message  # the message itself stays one line


@pytest.mark.parametrize("linked", ["drivers/m", "drivers"])
def test_a_source_through_a_symbolic_link_is_refused(tmp_path: Path, linked: str) -> None:
    """The link may be the source folder itself or one of its parents; the files would come from outside."""
    outside = tmp_path / "outside"
    (outside / "m").mkdir(parents=True)
    (outside / "m" / "driver.py").write_text("class D:\n    pass\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[project]\nversion = "1.0"\n')
    (tree / "drivers.toml").write_text(driver())
    if linked == "drivers":
        (tree / "drivers").symlink_to(outside, target_is_directory=True)
    else:
        (tree / "drivers").mkdir()
        (tree / "drivers" / "m").symlink_to(outside / "m", target_is_directory=True)
    with pytest.raises(PackageError) as caught:
        load_manifest(tree / "drivers.toml", "drivers.toml")
    assert str(caught.value) == (
        f"drivers.toml: driver 'Mutex Service Driver': source drivers/m goes through the symbolic link "
        f"{linked}; put the real folder in the tree"
    )
