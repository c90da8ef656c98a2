"""Helpers of the release tests: the bundle builder (``tools/dist.py``), commands in a clean environment,
and clean Python 3.9 virtualenvs installed from the bundle alone."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import List

from python39 import clean_environment, python39

ROOT = Path(__file__).resolve().parents[2]
DIST_ENV = "CLOUDSHELL_MUTEX_DIST"


@functools.cache
def dist_tool() -> ModuleType:
    """``tools/dist.py``, the bundle builder of ``make dist`` (a script, not part of the library)."""
    spec = importlib.util.spec_from_file_location("cloudshell_mutex_dist_tool", ROOT / "tools" / "dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(command: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command in a clean environment; its output is kept for the assertion message."""
    kwargs.setdefault("env", clean_environment())
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)


def offline_venv(venv: Path, bundle: Path, *requirements: str) -> Path:
    """A new Python 3.9 virtualenv with ``requirements`` installed from ``bundle`` alone (``--no-index``)."""
    created = run([python39(), "-m", "venv", str(venv)])
    assert created.returncode == 0, created.stderr
    install = [str(venv_python(venv)), "-m", "pip", "install", "--no-index", "--find-links", str(bundle)]
    # A proxy that refuses every connection: any download attempt would fail the install.
    nowhere = {
        name: "http://127.0.0.1:9" for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
    }
    installed = run([*install, *requirements], env=clean_environment(**nowhere))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv
