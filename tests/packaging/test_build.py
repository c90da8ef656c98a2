"""The package build: reproducible bytes, driver zips and wiring, and validation before writing."""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging import command
from cloudshell_mutex.packaging.build import PackageSources, build_package, build_package_bytes
from cloudshell_mutex.packaging.format import (
    DATAMODEL_PATH,
    DRIVERS_FOLDER,
    METADATA_PATH,
    PackageError,
    parse_driver_metadata,
    read_package,
)
from cloudshell_mutex.packaging.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
DRIVER_NAME = "Mutex Service Driver"
DRIVER_ZIP = f"{DRIVERS_FOLDER}/{DRIVER_NAME}.zip"

MANIFEST = f"""
[[driver]]
name = "{DRIVER_NAME}"
source = "drivers/mutex"
version = "1.2.0"
python_version = "3"
main_class = "driver.MutexServiceDriver"
models = ["{protocol.SERVICE_MODEL}"]
requirements = ["cloudshell-mutex=={{project_version}}", "cloudshell-shell-core>=6,<7"]
"""


def make_tree(root: Path, manifest: str = MANIFEST, files: Optional[Dict[str, str]] = None) -> Path:
    """A source tree with the real data model and metadata, a manifest and driver files."""
    shutil.copytree(ROOT / "DataModel", root / "DataModel")
    shutil.copytree(ROOT / "package", root / "package")
    (root / "pyproject.toml").write_text('[project]\nname = "cloudshell-mutex"\nversion = "0.9.1"\n')
    (root / "drivers.toml").write_text(manifest)
    default_files = {"drivers/mutex/driver.py": "class MutexServiceDriver:\n    pass\n"}
    for relative, text in (default_files if files is None else files).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def build(root: Path) -> bytes:
    return build_package_bytes(PackageSources.in_tree(root))[0]


def entries(data: bytes) -> Dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def run_cli(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_repository_package_builds_reproducibly(tmp_path: Path) -> None:
    first = build_package(PackageSources.in_tree(ROOT), tmp_path / "a" / "Mutex_Package.zip")
    second = build_package(PackageSources.in_tree(ROOT), tmp_path / "b" / "Mutex_Package.zip")
    assert first.sha256 == second.sha256
    data = first.path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == first.sha256
    assert data == second.path.read_bytes()
    package = read_package(data)
    assert package.datamodel.model(protocol.SERVICE_MODEL).attributes == (
        protocol.ATTR_OWNER,
        *protocol.LEASE_ATTRIBUTES,
    )
    drivers = sorted(spec.name for spec in load_manifest(ROOT / "drivers.toml").drivers)
    assert list(entries(data)) == [METADATA_PATH, DATAMODEL_PATH] + [
        f"{DRIVERS_FOLDER}/{d}.zip" for d in drivers
    ]
    if not drivers:  # without drivers, the data model is shipped exactly as written
        assert entries(data)[DATAMODEL_PATH] == (ROOT / "DataModel" / "datamodel.xml").read_bytes()


def test_zip_entries_carry_no_build_time_or_mode(tmp_path: Path) -> None:
    data = build(make_tree(tmp_path))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {info.external_attr >> 16 for info in infos} == {0o100644}


def test_same_inputs_same_bytes_whatever_mtime_mode_or_creation_order(tmp_path: Path) -> None:
    files = {
        "drivers/mutex/driver.py": "class MutexServiceDriver:\n    pass\n",
        "drivers/mutex/helpers/a.py": "A = 1\n",
        "drivers/mutex/helpers/b.py": "B = 2\n",
    }
    first = make_tree(tmp_path / "one", files=files)
    second = make_tree(tmp_path / "two", files=dict(reversed(list(files.items()))))
    os.utime(second / "drivers/mutex/helpers/a.py", (1_000_000_000, 1_000_000_000))
    os.chmod(second / "drivers/mutex/driver.py", 0o755)
    assert build(first) == build(second)
    # ...and a content change does change the bytes.
    (second / "drivers/mutex/helpers/b.py").write_text("B = 3\n")
    assert build(first) != build(second)


def test_the_bytes_do_not_depend_on_the_zlib_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """zlib builds (zlib-ng on some distributions) deflate the same input to different bytes."""
    root = make_tree(tmp_path)
    expected = build(root)
    real = zlib.compressobj

    def other_zlib(level: int = -1, method: int = zlib.DEFLATED, wbits: int = 15, *_args, **_kwargs):
        return real(level, method, wbits, 1, zlib.Z_FILTERED)

    monkeypatch.setattr(zlib, "compressobj", other_zlib)
    assert build(root) == expected


def test_symbolic_links_are_refused(tmp_path: Path) -> None:
    """os.walk would skip a linked folder silently, and git on Windows checks a link out as a text file."""
    root = make_tree(tmp_path / "tree")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("X = 1\n")
    (root / "drivers/mutex/lib").symlink_to(tmp_path / "lib", target_is_directory=True)
    with pytest.raises(PackageError) as caught:
        build(root)
    assert str(caught.value) == "drivers/mutex/lib: a symbolic link; put the real file or folder there"


def test_driver_zip_and_wiring(tmp_path: Path) -> None:
    root = make_tree(
        tmp_path,
        files={
            "drivers/mutex/driver.py": "class MutexServiceDriver:\n    pass\n",
            "drivers/mutex/__pycache__/driver.cpython-311.pyc": "x",
            "drivers/mutex/.hidden": "x",
        },
    )
    data = build(root)
    package = read_package(data)
    assert package.datamodel.model(protocol.SERVICE_MODEL).drivers == (DRIVER_NAME,)
    assert package.datamodel.driver_descriptors == (DRIVER_NAME,)
    driver_entries = entries(package.drivers[DRIVER_NAME])
    assert sorted(driver_entries) == ["driver.py", "drivermetadata.xml", "requirements.txt"]
    metadata = parse_driver_metadata(driver_entries["drivermetadata.xml"])
    assert (metadata.name, metadata.version, metadata.main_class, metadata.python_version) == (
        DRIVER_NAME,
        "1.2.0",
        "driver.MutexServiceDriver",
        "3",
    )
    assert driver_entries["requirements.txt"] == b"cloudshell-mutex==0.9.1\ncloudshell-shell-core>=6,<7\n"
    assert list(entries(data)) == [METADATA_PATH, DATAMODEL_PATH, DRIVER_ZIP]


def test_driver_layout_is_kept_and_identity_checked(tmp_path: Path) -> None:
    layout = (
        '<Driver Name="Mutex Service Driver" Version="1.2.0" MainClass="driver.MutexServiceDriver">\n'
        '  <Layout><Category Name="Mutex">'
        '<Command Name="status" DisplayName="Status" /></Category></Layout>\n'
        "</Driver>\n"
    )
    files = {"drivers/mutex/driver.py": "", "drivers/mutex/drivermetadata.xml": layout}
    driver_entries = entries(read_package(build(make_tree(tmp_path / "a", files=files))).drivers[DRIVER_NAME])
    assert b'<Command Name="status" DisplayName="Status" />' in driver_entries["drivermetadata.xml"]
    assert b'PythonVersion="3"' in driver_entries["drivermetadata.xml"]

    files["drivers/mutex/drivermetadata.xml"] = layout.replace('Version="1.2.0"', 'Version="9.9"')
    with pytest.raises(PackageError) as caught:
        build(make_tree(tmp_path / "b", files=files))
    assert str(caught.value) == (
        "drivers/mutex/drivermetadata.xml: Version='9.9' but drivers.toml declares '1.2.0' "
        "for driver 'Mutex Service Driver'"
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda root: (root / "DataModel/datamodel.xml").write_text(
                "<DataModelInfo><Attributes></DataModelInfo>"
            ),
            "DataModel/datamodel.xml: not well-formed XML (line 1, column 30): mismatched tag",
        ),
        (
            lambda root: shutil.rmtree(root / "drivers/mutex"),
            "drivers.toml: driver 'Mutex Service Driver': source folder drivers/mutex does not exist",
        ),
        (
            lambda root: (root / "drivers.toml").write_text(
                MANIFEST + MANIFEST.replace('Mutex Service"]', 'X"]')
            ),
            "drivers.toml: duplicate driver name 'Mutex Service Driver'",
        ),
        (
            lambda root: (root / "drivers.toml").write_text(
                MANIFEST.replace('["Mutex Service"]', '["Nope"]')
            ),
            "drivers.toml: driver 'Mutex Service Driver' serves model 'Nope', "
            "which DataModel/datamodel.xml does not define",
        ),
        (
            lambda root: (root / "drivers/mutex/requirements.txt").write_text("x\n"),
            "drivers/mutex/requirements.txt: declare the requirements of driver 'Mutex Service Driver' "
            "in drivers.toml instead",
        ),
        (
            lambda root: (root / "package/metadata.xml").unlink(),
            "package/metadata.xml: not found",
        ),
        (
            lambda root: (
                (root / "package/Categories").mkdir() or (root / "package/Categories/c.xml").write_text("<a>")
            ),
            "package/Categories/c.xml: not well-formed XML (line 1, column 4): no element found",
        ),
    ],
)
def test_invalid_inputs_fail_naming_the_file_and_write_nothing(tmp_path: Path, change, problem: str) -> None:
    root = make_tree(tmp_path / "tree")
    change(root)
    output = tmp_path / "out" / "Mutex_Package.zip"
    with pytest.raises(PackageError) as caught:
        build_package(PackageSources.in_tree(root), output)
    assert str(caught.value) == problem
    assert not output.parent.exists()


def test_datamodel_wiring_must_agree_with_the_manifest(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    datamodel = root / "DataModel/datamodel.xml"
    text = datamodel.read_text()
    text = text.replace("<Drivers />", "<Drivers><DriverName>Old Driver</DriverName></Drivers>")
    text = text.replace(
        "<DriverDescriptors />",
        '<DriverDescriptors><DriverDescriptor Name="Old Driver" DriverType="PythonDriver" />'
        "</DriverDescriptors>",
    )
    datamodel.write_text(text)
    with pytest.raises(
        PackageError, match=r"model 'Mutex Service' names driver\(s\) Old Driver but drivers\.toml"
    ):
        build(root)


def test_only_a_served_model_needs_a_drivers_element(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    datamodel = root / "DataModel/datamodel.xml"
    other = '<ResourceModel Name="Other"><AttachedAttributes /></ResourceModel>'
    datamodel.write_text(datamodel.read_text().replace("</Models>", other + "</Models>"))
    assert read_package(build(root)).datamodel.model("Other").drivers == ()

    (root / "drivers.toml").write_text(MANIFEST.replace('["Mutex Service"]', '["Other"]'))
    with pytest.raises(PackageError) as caught:
        build(root)
    assert str(caught.value) == (
        "DataModel/datamodel.xml: model 'Other' has no <Drivers> element for the build to fill"
    )


def test_cli_package_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = make_tree(tmp_path / "tree")
    output = tmp_path / "dist" / "Mutex_Package.zip"
    assert run_cli(["package", "--root", str(root), "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert f"sha256 {hashlib.sha256(output.read_bytes()).hexdigest()}" in out

    (root / "DataModel/datamodel.xml").write_text("<broken")
    before = output.read_bytes()
    assert run_cli(["package", "--root", str(root), "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: DataModel/datamodel.xml: not well-formed XML")
    assert output.read_bytes() == before  # the previous build is left intact


def test_cli_package_reports_an_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = make_tree(tmp_path / "tree")
    output = tmp_path / "taken"
    (output / "Mutex_Package.zip").mkdir(parents=True)  # a folder where the zip should go
    assert run_cli(["package", "--root", str(root), "--output", str(output / "Mutex_Package.zip")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {output / 'Mutex_Package.zip'}: cannot be written: ")
    assert sorted(path.name for path in output.iterdir()) == ["Mutex_Package.zip"]  # no .partial left


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda root: (root / "DataModel/datamodel.xml").write_text(
                "<DataModelInfo>\n<Attributes>\n</Data>"
            ),
            "error: DataModel/datamodel.xml: not well-formed XML (line 3, column 3): mismatched tag\n",
        ),
        (
            lambda root: shutil.rmtree(root / "drivers/mutex"),
            "error: drivers.toml: driver 'Mutex Service Driver': "
            "source folder drivers/mutex does not exist\n",
        ),
        (
            lambda root: (root / "drivers.toml").write_text(MANIFEST + MANIFEST.replace('Service"]', 'X"]')),
            "error: drivers.toml: duplicate driver name 'Mutex Service Driver'\n",
        ),
    ],
)
def test_cli_package_reports_each_problem_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture, change, problem: str
) -> None:
    root = make_tree(tmp_path / "tree")
    change(root)
    output = tmp_path / "dist" / "Mutex_Package.zip"
    assert run_cli(["package", "--root", str(root), "--output", str(output)]) == 1
    captured = capsys.readouterr()
    assert captured.err == problem
    assert captured.out == ""
    assert not output.exists()


def edit_datamodel(old: str, new: str) -> Callable[[Path], None]:
    """A change to the tree's data model that replaces ``old`` (which must be there) with ``new``."""

    def change(root: Path) -> None:
        path = root / "DataModel/datamodel.xml"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    return change


def drop_mutex_owner(root: Path) -> None:
    """Remove Mutex Owner from the tree's data model: its definition, attachment and value."""
    path = root / "DataModel/datamodel.xml"
    text = re.sub(
        r'\s*<AttributeInfo Name="Mutex Owner".*?</AttributeInfo>', "", path.read_text(), flags=re.S
    )
    text = re.sub(r'\s*<AttachedAttribute Name="Mutex Owner".*?</AttachedAttribute>', "", text, flags=re.S)
    path.write_text(text.replace('<AttributeValue Name="Mutex Owner" Value="" />', ""))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            edit_datamodel('Name="Mutex Service Family"', 'Name="Lock Family"'),
            "no family 'Mutex Service Family' (found: 'Lock Family'); this is not a Mutex package",
        ),
        (
            edit_datamodel('ResourceModel Name="Mutex Service"', 'ResourceModel Name="Lock Service"'),
            "family 'Mutex Service Family' has no model 'Mutex Service' (found: 'Lock Service')",
        ),
        (
            edit_datamodel('IsAdminOnly="true"', 'IsAdminOnly="false"'),
            "family 'Mutex Service Family' must be admin-only (IsAdminOnly=\"true\")",
        ),
        (
            edit_datamodel(' IsAdminOnly="true"', ""),
            "family 'Mutex Service Family' must be admin-only (IsAdminOnly=\"true\")",
        ),
        (
            edit_datamodel('IsService="true"', 'IsService="false"'),
            "family 'Mutex Service Family' must be a service family",
        ),
        (
            drop_mutex_owner,
            "model 'Mutex Service' must define and attach attribute 'Mutex Owner'",
        ),
        (
            edit_datamodel('<Rule Name="Setting" />', ""),
            "attribute 'Mutex Owner' must keep the original definition, but its Rules is ('Configuration',) "
            "instead of ('Configuration', 'Setting')",
        ),
        (
            edit_datamodel('Description="Mutex usage:', 'Description="Usage:'),
            "attribute 'Mutex Owner' must keep the original definition, but its Description",
        ),
        (
            edit_datamodel('<Rules Override="false">', "<Rules>"),
            "its Rules Override is None instead of 'false'",
        ),
    ],
)
def test_package_refuses_a_datamodel_that_is_no_longer_the_mutex_package(
    tmp_path: Path, capsys: pytest.CaptureFixture, change, problem: str
) -> None:
    root = make_tree(tmp_path / "tree")
    change(root)
    output = tmp_path / "dist" / "Mutex_Package.zip"
    assert run_cli(["package", "--root", str(root), "--output", str(output)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: DataModel/datamodel.xml: ")
    assert problem in captured.err
    assert not output.exists()
