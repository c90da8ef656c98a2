"""Shared test fixtures. Must import on Python 3.9 with only the library and its [cli,driver] extras."""

from __future__ import annotations

import io
import signal
import zipfile
from pathlib import Path

import pytest

from client_features import CLIENT_RESENDS, CLIENT_TAKES_TIMEOUT

pytest_plugins = ["cloudshell_mutex.testing"]

ASSETS = Path(__file__).parent / "assets"

# A run started in the background by a non-interactive shell (`make test &`, nohup, some CI runners) has
# SIGINT ignored, and an ignored signal stays ignored in every child: the Ctrl-C tests' children would never
# see their SIGINT. A handler, unlike SIG_IGN, is reset to the default on exec, so children get Ctrl-C back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def zip_folder(folder: Path) -> bytes:
    """Zip a package folder as the original's package.cmd (7-Zip) did: deflated, folders as entries."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() or path.is_dir():
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


@pytest.fixture
def original_package_zip(tmp_path: Path) -> Path:
    """The original, datamodel-only Mutex_Package.zip of 2017 (only the Mutex Owner attribute)."""
    path = tmp_path / "Mutex_Package_original.zip"
    path.write_bytes(zip_folder(ASSETS / "original_mutex_package"))
    return path


@pytest.fixture
def our_model_package() -> bytes:
    """This tree's data model (Mutex Owner, Label, the lease attributes, Generation) as a package, without the
    driver: what the lock's tests need of our package."""
    root = Path(__file__).resolve().parents[1]
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(root / "package" / "metadata.xml", "metadata.xml")
        archive.write(root / "DataModel" / "datamodel.xml", "DataModel/datamodel.xml")
    return package.getvalue()


@pytest.fixture
def original_package_no_attributes_zip(tmp_path: Path) -> Path:
    """The original package as built from its current source: a Mutex Service model with no attributes."""
    path = tmp_path / "Mutex_Package_original_no_attributes.zip"
    path.write_bytes(zip_folder(ASSETS / "original_mutex_package_no_attributes"))
    return path


def pytest_collection_modifyitems(items) -> None:
    """Skip tests that need a client feature the installed cloudshell-automation-api lacks."""
    for item in items:
        if item.get_closest_marker("client_resend") and not CLIENT_RESENDS:
            item.add_marker(pytest.mark.skip(reason="this client does not re-send dropped requests"))
        if item.get_closest_marker("client_timeout") and not CLIENT_TAKES_TIMEOUT:
            item.add_marker(pytest.mark.skip(reason="this client takes no socket timeout"))
