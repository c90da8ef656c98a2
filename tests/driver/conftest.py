"""Fixtures of the driver tests."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch):
    """An emulator with the original package imported; the driver's logs go under tmp_path."""
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    return cloudshell_emulator_factory(packages=[original_package_zip])


@pytest.fixture
def our_package_zip(tmp_path):
    """This project's Mutex_Package data model (the lease attributes included), zipped for import."""
    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "Mutex_Package.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(root / "package" / "metadata.xml", "metadata.xml")
        archive.write(root / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    return path
