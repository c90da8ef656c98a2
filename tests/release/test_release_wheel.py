"""The wheel: only the runtime dependencies in its metadata, typed, one version everywhere."""

from __future__ import annotations

import email.parser
import re
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest

from cloudshell_mutex import __version__

pytestmark = pytest.mark.dist

#: What ``pip install cloudshell-mutex`` brings: the lock, the driver mixin and the orchestration helper
#: need the API client and filelock (cohort mode), nothing else.
RUNTIME = {"cloudshell-automation-api", "filelock"}
#: The extras a release offers; the tools of the tests are a dependency group, not published.
EXTRAS = {
    "cli": {"cloudshell-rest-api", "requests", "pyyaml", "tomli"},
    "driver": {"cloudshell-shell-core", "cloudshell-logging"},
}


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.BytesParser().parsebytes(archive.read(name))


def requirement_name(line: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", line, maxsplit=1)[0].lower().replace("_", "-")


def test_the_metadata_lists_only_the_runtime_dependencies(wheel: Path) -> None:
    message = metadata(wheel)
    required: List[str] = message.get_all("Requires-Dist") or []
    unconditional = {requirement_name(line) for line in required if "extra ==" not in line}
    assert unconditional == RUNTIME
    by_extra: Dict[str, set] = {}
    for line in required:
        found = re.search(r"extra == ['\"]([a-z]+)['\"]", line)
        if found:
            by_extra.setdefault(found.group(1), set()).add(requirement_name(line))
    assert by_extra == EXTRAS
    assert set(message.get_all("Provides-Extra") or []) == set(EXTRAS)


def test_the_wheel_is_typed_and_carries_the_one_version(wheel: Path) -> None:
    message = metadata(wheel)
    assert message["Version"] == __version__
    assert message["Requires-Python"] == ">=3.9"
    assert "Typing :: Typed" in (message.get_all("Classifier") or [])
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "cloudshell_mutex/py.typed" in names
        init = archive.read("cloudshell_mutex/__init__.py").decode()
    assert f'__version__ = "{__version__}"' in init
    # Namespace packages belong to the cloudshell-* distributions (a cloudshell/__init__.py here would clash).
    assert not any(name.startswith("cloudshell/") for name in names)
