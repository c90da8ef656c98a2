"""Fixtures of the driver tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def emu(cloudshell_emulator_factory, original_package_zip, tmp_path, monkeypatch):
    """An emulator with the original package imported; the driver's logs go under tmp_path."""
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    return cloudshell_emulator_factory(packages=[original_package_zip])
