"""The interpreter execution servers run (CPython 3.9), for tests that build clean virtualenvs with it."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from typing import Dict

import pytest


def python39() -> str:
    """The interpreter the Makefile uses for .venv39 (PYTHON39, else pyenv's 3.9, else python3.9)."""
    candidates = [os.environ.get("PYTHON39", "")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    candidates += [shutil.which("python3.9") or ""]
    for candidate in filter(None, candidates):
        probe = [candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 9))"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return candidate
    pytest.fail("Python 3.9 not found: install it (pyenv install 3.9) or set PYTHON39=/path/to/python3.9")


def clean_environment(**extra: str) -> Dict[str, str]:
    """This process's environment without pip's settings (no config file, no PIP_* variable such as a
    machine-wide PIP_FIND_LINKS) and without PYTHON* variables: a virtualenv sees only what a test gives
    it."""
    dropped = ("PIP_", "PYTHON", "VIRTUAL_ENV")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    environment["PIP_CONFIG_FILE"] = os.devnull
    environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    environment.update(extra)
    return environment
