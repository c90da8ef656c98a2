"""What a release ships, built once per test session: the wheel, the offline bundle, and a clean Python 3.9
virtualenv that has only the wheel and its runtime dependencies, installed from the bundle with no index.

``make test`` builds the wheel and the bundle from this tree (the bundle's ``pip download`` is the one step
that reaches the package index; it takes seconds with pip's cache). ``make test-dist`` sets
``CLOUDSHELL_MUTEX_DIST`` to the ``dist/`` that ``make dist`` wrote in a fresh clone, and the same tests
check those files instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from release_support import DIST_ENV, ROOT, dist_tool, offline_venv, run

from cloudshell_mutex import __version__
from python39 import python39


@pytest.fixture(scope="session")
def dist_dir(tmp_path_factory) -> Path:
    """``dist/`` of a fresh clone (``make test-dist``), or one built here: the wheel, then the bundle."""
    given = os.environ.get(DIST_ENV)
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)])
    assert built.returncode == 0, built.stdout + built.stderr
    tool = dist_tool()
    wheel = out / f"cloudshell_mutex-{__version__}-py3-none-any.whl"
    requirements = tool.driver_requirements(ROOT / "drivers.toml")
    tool.build_bundle(python39(), wheel, out / "offline_requirements", requirements)
    return out


@pytest.fixture(scope="session")
def wheel(dist_dir: Path) -> Path:
    """The library's wheel."""
    path = dist_dir / f"cloudshell_mutex-{__version__}-py3-none-any.whl"
    assert path.is_file(), f"{path} missing: run make dist"
    return path


@pytest.fixture(scope="session")
def bundle(dist_dir: Path) -> Path:
    """The offline bundle (``dist/offline_requirements``)."""
    path = dist_dir / "offline_requirements"
    assert path.is_dir(), f"{path} missing: run make dist"
    return path


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory, bundle: Path) -> Path:
    """A clean Python 3.9 virtualenv with ``pip install cloudshell-mutex`` from the bundle alone: the wheel
    and its runtime dependencies, nothing else (no extras)."""
    return offline_venv(tmp_path_factory.mktemp("runtime") / "venv", bundle, "cloudshell-mutex")
