"""The README's admin section runs as written: its shell blocks, in bash, against the emulator.

The harness provides what the text says the reader has: the connection settings in ``CLOUDSHELL_*``
variables, ``dist/Mutex_Package.zip`` built from this tree, ``cloudshell-mutex`` on the PATH, and a sandbox
(``$SANDBOX_ID``) whose lock is held.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudshell_mutex import ReservationMutex
from cloudshell_mutex.packaging.build import PackageSources, build_package

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTION = README.split("## Admin", 1)[1].split("\n## ", 1)[0]
SHELL_BLOCKS = re.findall(r"^```sh\n(.*?)^```$", SECTION, re.MULTILINE | re.DOTALL)
PASSWORD = "Readme-Adm1n-pw"


def test_the_admin_section_has_one_shell_block():
    assert len(SHELL_BLOCKS) == 1, "a README admin block was added or removed: update this test"


def test_admin_block_installs_the_driver_shows_and_releases_the_lock(cloudshell_emulator_factory, tmp_path):
    emu = cloudshell_emulator_factory(admin_password=PASSWORD)
    build_package(PackageSources.in_tree(ROOT), tmp_path / "dist" / "Mutex_Package.zip")
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CLOUDSHELL_HOST": emu.host,
        "CLOUDSHELL_PORT": str(emu.quali_port),
        "CLOUDSHELL_API_PORT": str(emu.port),
        "CLOUDSHELL_PASSWORD": PASSWORD,
    }
    # `install` must come first: the sandbox and its lock need the model it imports. Run it, make the
    # sandbox, then run the rest of the block.
    install, rest = SHELL_BLOCKS[0].split("\n", 1)
    assert install.startswith("cloudshell-mutex install")
    first = subprocess.run(
        ["bash", "-e", "-c", install],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    assert "Mutex Service Driver" in emu.runtime.state.drivers  # the package brought the driver
    sandbox = emu.create_reservation("README admin")
    lock = ReservationMutex(emu.session(), sandbox, owner="Router A driver")
    assert lock.acquire(timeout=10)
    second = subprocess.run(
        ["bash", "-e", "-c", rest],
        env={**environment, "SANDBOX_ID": sandbox},
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "is held by Router A driver" in second.stdout and "force-released 'MUTEX'" in second.stdout
    assert emu.control.reservation(sandbox)["services"] == []
    assert any("Reason: driver crashed on exec-02" in line for line in emu.control.output(sandbox))
    assert PASSWORD not in first.stdout + first.stderr + second.stdout + second.stderr
