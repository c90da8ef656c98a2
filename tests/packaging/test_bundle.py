"""drivers.toml ``bundle``: library code from src/ shipped inside a driver zip, reproducibly."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path
from typing import Dict

import pytest

from cloudshell_mutex import protocol
from cloudshell_mutex.packaging.build import PackageSources, build_package_bytes
from cloudshell_mutex.packaging.format import PackageError, read_package

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "Mutex Service Driver"

MANIFEST = f"""
[[driver]]
name = "{DRIVER}"
source = "drivers/m"
version = "1.0.0"
python_version = "3"
main_class = "driver.D"
models = ["{protocol.SERVICE_MODEL}"]
bundle = BUNDLE
"""


def tree(root: Path, bundle: str, files: Dict[str, str]) -> Path:
    shutil.copytree(ROOT / "DataModel", root / "DataModel")
    shutil.copytree(ROOT / "package", root / "package")
    (root / "drivers.toml").write_text(MANIFEST.replace("BUNDLE", bundle))
    for relative, text in {"drivers/m/driver.py": "class D:\n    pass\n", **files}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def driver_entries(root: Path) -> Dict[str, bytes]:
    package = read_package(build_package_bytes(PackageSources.in_tree(root))[0])
    with zipfile.ZipFile(io.BytesIO(package.drivers[DRIVER])) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_bundled_folders_and_files_land_at_their_src_path(tmp_path: Path) -> None:
    files = {
        "src/lib/__init__.py": "",
        "src/lib/core/__init__.py": "X = 1\n",
        "src/lib/core/__pycache__/x.cpython-311.pyc": "cache",
        "src/lib/core/.hidden": "x",
        "src/lib/cli.py": "not bundled\n",
    }
    entries = driver_entries(tree(tmp_path, '["lib/__init__.py", "lib/core"]', files))
    assert sorted(entries) == [
        "driver.py", "drivermetadata.xml", "lib/__init__.py", "lib/core/__init__.py", "requirements.txt",
    ]  # fmt: skip
    assert entries["lib/core/__init__.py"] == b"X = 1\n"


def test_the_same_sources_give_the_same_bytes(tmp_path: Path) -> None:
    files = {"src/lib/__init__.py": "", "src/lib/a.py": "A = 1\n"}
    first = build_package_bytes(PackageSources.in_tree(tree(tmp_path / "a", '["lib"]', files)))[0]
    second_root = tree(tmp_path / "b", '["lib"]', files)
    (second_root / "src/lib/a.py").touch()  # another mtime
    assert build_package_bytes(PackageSources.in_tree(second_root))[0] == first


@pytest.mark.parametrize(
    ("bundle", "files", "problem"),
    [
        ('["../secrets"]', {}, "bundle item '../secrets' must be a path under src/"),
        ('["lib"]', {}, "bundle item src/lib does not exist"),
        ('"lib"', {}, "bundle must be a list of non-empty strings"),
        # A bundled file may not replace one of the driver folder's.
        ('["driver.py"]', {"src/driver.py": ""}, "bundled into driver 'Mutex Service Driver' as driver.py"),
    ],
)
def test_bad_bundles_are_refused_clearly(tmp_path: Path, bundle: str, files: Dict[str, str], problem: str):
    with pytest.raises(PackageError) as caught:
        driver_entries(tree(tmp_path, bundle, files))
    assert problem in str(caught.value)
