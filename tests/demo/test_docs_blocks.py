"""The python blocks of docs/ that a reader runs as written against `make emulator` run, here against an
emulator on free ports that has this tree's package imported (what `make emulator` does), with
``dist/Mutex_Package.zip`` in the working folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudshell_mutex import emulated
from cloudshell_mutex.packaging.build import PackageSources, build_package

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The docs whose python blocks all run against `make emulator`, and how many each has.
RUNNABLE = {"docs/admin.md": 1}


def blocks(doc: str):
    text = (ROOT / doc).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("doc", sorted(RUNNABLE))
def test_every_python_block_is_counted(doc):
    assert len(blocks(doc)) == RUNNABLE[doc], (
        f"a python block of {doc} was added or removed: update this test"
    )


@pytest.mark.parametrize("doc", sorted(RUNNABLE))
def test_the_admins_mutex_service_block_runs_and_force_releases(
    doc, cloudshell_emulator_factory, tmp_path, monkeypatch, capsys
):
    package = tmp_path / "dist" / "Mutex_Package.zip"
    build_package(PackageSources.in_tree(ROOT), package)
    emu = cloudshell_emulator_factory(packages=[package])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOG_PATH", str(tmp_path / "logs"))
    monkeypatch.setattr(emulated, "DEFAULT_PORT", emu.port)
    monkeypatch.setattr(emulated, "DEFAULT_QUALI_PORT", emu.quali_port)
    for index, block in enumerate(blocks(doc)):
        exec(compile(block, f"{doc} python block {index + 1}", "exec"), {"__name__": f"docs_block_{index}"})
    printed = capsys.readouterr().out
    assert "is held by Crashed driver" in printed
    assert "force-released 'MUTEX'" in printed and "Reason: driver crashed on exec-02" in printed
    assert (
        printed.rstrip().splitlines()[-1].startswith("WARNING: admin (Mutex Service command Force Release)")
    )
    added = [e for e in emu.control.events() if e["op"] == "service_added" and e["alias"] == "MUTEX"]
    removed = [e for e in emu.control.events() if e["op"] == "service_removed" and e["alias"] == "MUTEX"]
    assert len(added) == len(removed) == 1
